"""EMULATED nixl for the testbed's stand-in image (see ../README.md). Not NIXL."""
