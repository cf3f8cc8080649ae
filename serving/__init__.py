"""vLLM serving and the client every experiment uses (serving/client.py)."""
