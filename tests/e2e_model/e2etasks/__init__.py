"""Task types for simrun's end-to-end tests: slow units, a memory hog, a failing task."""
