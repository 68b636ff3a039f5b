"""Packaged reference data: published XDNA2 measurements (copies of the project reference files, sources inside)."""
