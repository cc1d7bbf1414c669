"""The overview page: the home page summing up datasets, jobs, nodes and the review backlog."""
