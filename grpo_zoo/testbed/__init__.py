"""The built-in multimodal testbed: task, tokenizer, tiny VLM, warm-up."""
