"""A Flower project on scikit-learn's digits, with fedsafe's strategy."""
