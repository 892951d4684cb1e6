"""Worker processes, the shared-memory batch ring they write into, and their failure handling."""
