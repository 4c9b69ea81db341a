//! Hostile clients: outbox (filled in by issue 29's work).
