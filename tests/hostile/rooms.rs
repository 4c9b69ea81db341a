//! Hostile clients: rooms (filled in by issue 29's work).
