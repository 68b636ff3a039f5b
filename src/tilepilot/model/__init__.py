"""Model frontend: spec from config.json, safetensors checkpoints, tokenizer, and the zoo writer."""
