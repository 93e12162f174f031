"""fedsafe as a Flower app."""
