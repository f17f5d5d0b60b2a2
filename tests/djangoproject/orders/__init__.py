"""The shop's order API: views behind onceonly's Idempotency-Key (no models)."""
