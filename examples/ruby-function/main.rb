# A Ruby function: the JSON request body arrives as `event` (a Hash); the returned value is the answer.
def handle(event, context)
  greeting = ENV.fetch("GREETING", "hello")
  { greeting: greeting, echo: event["message"], keys: event.keys.sort, session_id: context.session_id }
end
