"""The shared layer of the backends whose hosts run on this machine (local processes, Docker
containers): the job directory, its supervisor, restarts, S3 staging and the job handle. The
local and Docker backends compose it; it imports neither of them."""
