//! Hostile clients: http (filled in by issue 29's work).
