// A Go function: the JSON request body arrives as `event`; the returned value is the answer.
// The platform compiles the package with a `main` of its own, so this file defines only Handle.
package main

import (
	"os"
	"sort"
)

func Handle(event map[string]any, context map[string]any) (any, error) {
	greeting := os.Getenv("GREETING")
	if greeting == "" {
		greeting = "hello"
	}
	keys := make([]string, 0, len(event))
	for key := range event {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return map[string]any{"greeting": greeting, "echo": event["message"], "keys": keys, "session_id": context["session_id"]}, nil
}
