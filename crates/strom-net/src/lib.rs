//! strom-net (placeholder)
