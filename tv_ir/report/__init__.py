"""What a check returns: verdicts, the report with its replayed counterexample, its text."""
