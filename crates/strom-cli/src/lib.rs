//! strom-cli (placeholder)
