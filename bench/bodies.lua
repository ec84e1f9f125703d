-- wrk script: POST one JSON body per request from BODIES_FILE (one body per line).
-- Each thread takes its own slice of the lines, so no body is sent twice across threads
-- (a cleared verify needs an unused intent every time); a file with fewer lines than threads
-- is shared by all. HEADER_KEY holds the X-Service-Key.
local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local path = os.getenv("BODIES_FILE")
  local nthreads = tonumber(os.getenv("WRK_THREADS"))
  bodies = {}
  local all = {}
  local index = 0
  for line in io.lines(path) do
    if index % nthreads == id then
      table.insert(bodies, line)
    end
    table.insert(all, line)
    index = index + 1
  end
  if #bodies == 0 then
    -- fewer lines than threads: a body meant to be repeated (generate, a replayed verify), so
    -- share it; an empty slice would send empty POSTs (400s)
    bodies = all
  end
  position = 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-Service-Key"] = os.getenv("HEADER_KEY")
end

function request()
  position = position + 1
  if position > #bodies then
    position = 1  -- wrapped: further verifies are replays (the driver sizes the file to avoid it)
  end
  return wrk.format(nil, nil, nil, bodies[position])
end
