"""Published data sets by name: ``registry`` (``datasets.yaml``, fetching with checksums, name resolution) and ``cli`` (`medstack data`)."""
