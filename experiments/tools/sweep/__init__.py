"""`medstack sweep`: one study once per model under one sweep folder. ``run`` does it, ``cli`` declares the command."""
