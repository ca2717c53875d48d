// Keeps tandem_test_util non-empty.
