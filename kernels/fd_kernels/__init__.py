"""fd\x27s C++ custom operators for Paddle (CPU), with pure-Paddle references in fdcli_engine.ops."""
