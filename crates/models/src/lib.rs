//! The model catalog, GGUF reading and conversion to a Hugging Face directory, the default-model fetch, and seeded random models.
