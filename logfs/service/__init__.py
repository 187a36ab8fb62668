"""The trio runtime: background log management around a LogManager, all in one nursery."""
