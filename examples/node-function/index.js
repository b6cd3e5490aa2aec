// A Node.js function: the JSON request body arrives as `event`; the returned value is the answer.
exports.handle = async (event, context) => {
  const greeting = process.env.GREETING || "hello";
  return { greeting, echo: event.message, keys: Object.keys(event).sort(), session_id: context.session_id };
};
