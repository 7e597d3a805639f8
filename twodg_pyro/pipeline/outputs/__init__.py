"""What a run writes and measures of its trained methods (above the settings, below
the methods): the results table, the costs, the model files and diagnostics, the
uncertainty columns, and the ``evaluate`` / ``diagnose`` jobs on saved model files."""
