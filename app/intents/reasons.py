"""The block reasons of the verification gate, in the order the checks run."""
UNKNOWN = "UnknownIntent"
EXPIRED = "ExpiredIntent"
REPLAYED_INTENT = "ReplayedIntent"
INVALID_SIGNATURE = "InvalidSignature"
OUT_OF_WINDOW = "TimestampOutOfWindow"
REPLAYED_RESPONSE = "ReplayedResponse"
BLOCK_REASONS = (UNKNOWN, EXPIRED, REPLAYED_INTENT, INVALID_SIGNATURE, OUT_OF_WINDOW,
                 REPLAYED_RESPONSE)
