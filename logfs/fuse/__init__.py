"""The pyfuse3 layer: inodes, handles, xattrs, and the one place where engine errors become errno."""
