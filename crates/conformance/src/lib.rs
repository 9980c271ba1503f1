//! The op conformance suite: every op of a backend against the reference backend, by normalized mean squared error.
