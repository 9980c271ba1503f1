//! The reference backend: plain f32 Rust, written to be read; the oracle every other backend is checked against.
