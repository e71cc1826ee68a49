"""spanrl.serving."""
