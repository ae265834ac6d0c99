"""Work-arounds for the installed libraries, each in one named module."""
