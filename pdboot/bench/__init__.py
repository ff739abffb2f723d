"""``pdboot bench``: run (the load generator's sweep and its results) and chart (the SVG)."""
