"""spanrl.collector."""
