//! strom-client (placeholder)
