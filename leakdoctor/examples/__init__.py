"""Small real training loops with planted leaks, for `leakdoctor demo`. They are user code as far as
leakdoctor's location finder is concerned, so findings point into these files."""
