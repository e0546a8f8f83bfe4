"""Generated protobuf code."""
