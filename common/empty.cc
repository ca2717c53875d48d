// Keeps tandem_base non-empty while common/ has no other .cc files.
