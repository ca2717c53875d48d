// Keeps tandem_engine non-empty.
