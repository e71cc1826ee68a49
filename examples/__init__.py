"""Sample agents trained with spanrl. Each folder is self-contained and runnable as a script."""
