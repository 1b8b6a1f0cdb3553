"""Multi-modal inputs (images): what an image request carries to the engine, and the image processors
that turn pictures into pixel rows and placeholder tokens. A leaf package: numpy, PIL and msgspec only."""
