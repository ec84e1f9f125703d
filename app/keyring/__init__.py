"""SECRET_ENCRYPTION_KEY as a key ring: the first key seals, every key unseals, the database
records which keys sealed its secrets (key check values) so that a process holding other keys
refuses to start, and `flask secrets reseal` moves every stored secret to the first key."""
