//! Continuous-batching engine: scheduler, block manager with prefix caching, sequences, sampling. Pure CPU; knows no GPU API and no HTTP.
