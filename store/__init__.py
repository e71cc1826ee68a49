"""spanrl.store."""
