"""spanrl.algorithms."""
