//! Hostile clients: memory (filled in by issue 29's work).
