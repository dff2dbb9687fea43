"""http."""
