"""spanrl.instrumentation."""
