"""Support shared by tests/ and bench/ (the labelled zoo of models); neither the engine nor the
commands import it."""
