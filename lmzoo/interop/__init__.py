"""Models out of lmzoo and into it: Hugging Face Llama folders both ways, and lm-evaluation-harness."""
