// metadata
