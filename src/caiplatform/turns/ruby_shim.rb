# Runs a Ruby function for the harness: `ruby ruby_shim.rb <code dir>`.
# Loads <code dir>/main.rb (with the Gemfile's bundle when there is one) and calls its
# `handle(event, context)` for each JSON line on stdin ({id, event, context}), each call in its own
# thread; answers one JSON line per call on the protocol stream ({id, value} or {id, error}). The first
# line out is {ready: true} or {ready: false, error}. The function's own standard output (and that of
# any program it starts) goes to standard error, so it cannot corrupt the protocol.
require "json"

Encoding.default_external = Encoding::UTF_8
PROTOCOL = STDOUT.dup
PROTOCOL.sync = true
STDOUT.reopen(STDERR)
STDIN.set_encoding(Encoding::UTF_8)
SEND_LOCK = Mutex.new

def cai_send(message)
  line = begin
    JSON.generate(message)
  rescue StandardError, JSON::GeneratorError => e
    JSON.generate({ "id" => message["id"], "error" => "handle returned a value that is not JSON-serialisable: #{e.message}" })
  end
  SEND_LOCK.synchronize { PROTOCOL.write(line + "\n") }
end

def cai_describe(error)
  "#{error.class}: #{error.message}"
end

# The `context` argument: `context.session_id` and `context[:session_id]` both read a field.
CaiFunctionContext = Struct.new(:agent, :session_id, :user_id, :invocation_id, :history, keyword_init: true)

code_dir = ARGV.fetch(0)
begin
  Dir.chdir(code_dir)
  $LOAD_PATH.unshift(code_dir)
  gemfile = File.join(code_dir, "Gemfile")
  if File.file?(gemfile)
    ENV["BUNDLE_GEMFILE"] ||= gemfile
    require "bundler/setup"
  end
  load File.join(code_dir, "main.rb")
rescue Exception => e # rubocop:disable Lint/RescueException -- a SyntaxError is not a StandardError
  cai_send({ "ready" => false, "error" => "cannot load main.rb: #{cai_describe(e)}" })
  exit 1
end
unless respond_to?(:handle, true)
  cai_send({ "ready" => false, "error" => "main.rb must define `handle(event, context)`" })
  exit 1
end
HANDLE = method(:handle)
cai_send({ "ready" => true })

calls = []
while (line = STDIN.gets)
  calls.select!(&:alive?)
  begin
    request = JSON.parse(line)
  rescue JSON::ParserError
    next
  end
  calls << Thread.new(request) do |call|
    context = CaiFunctionContext.new(**(call["context"] || {}).transform_keys(&:to_sym))
    value = HANDLE.arity == 1 ? HANDLE.call(call["event"]) : HANDLE.call(call["event"], context)
    cai_send({ "id" => call["id"], "value" => value })
  rescue Exception => e # rubocop:disable Lint/RescueException -- report every failure of the call
    failed = { "id" => call["id"], "error" => cai_describe(e) }
    failed["out_of_memory"] = true if e.is_a?(NoMemoryError) # an allocation failed (a memory rlimit)
    cai_send(failed)
  end
end
# stdin closed: let the calls in flight answer before exiting.
calls.each(&:join)
