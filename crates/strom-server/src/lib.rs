//! strom-server (placeholder)
