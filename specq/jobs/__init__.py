"""The queue layer: input parsing and validation now; Redis and RQ glue to come."""
