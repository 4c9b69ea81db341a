//! Hostile clients: credentials (filled in by issue 29's work).
