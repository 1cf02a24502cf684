package rabbit

import (
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// splitNodes turns an AMQP URL whose host part lists several nodes,
// separated by commas (amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost),
// into one URL per node, each with the user, password, vhost and query of
// the original. A URL of one host comes back as it is.
func splitNodes(raw string) ([]string, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("rabbit: URL %s has no scheme://", redactNode(raw))
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	user := ""
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		user, authority = authority[:at+1], authority[at+1:]
	}
	hosts := strings.Split(authority, ",")
	nodes := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if h == "" {
			return nil, fmt.Errorf("rabbit: URL %s has an empty host in its list of nodes", redactNode(raw))
		}
		node := scheme + "://" + user + h + tail
		if _, err := amqp.ParseURI(node); err != nil {
			return nil, fmt.Errorf("rabbit: node %s of the URL: %w", redactNode(node), err)
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

// redactNode shows a URL of one node with its password hidden.
func redactNode(u string) string {
	uri, err := amqp.ParseURI(u)
	if err != nil {
		return "(invalid URL)"
	}
	uri.Password = "xxx"
	return uri.String()
}

// redact shows a URL, of one node or several, with its password hidden.
func redact(u string) string {
	nodes, err := splitNodes(u)
	if err != nil {
		return "(invalid URL)"
	}
	if len(nodes) == 1 {
		return redactNode(nodes[0])
	}
	// Every node has the same user part: hide the password in the text.
	scheme, rest, _ := strings.Cut(u, "://")
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		if user, _, ok := strings.Cut(rest[:at], ":"); ok {
			rest = user + ":xxx" + rest[at:]
		}
	}
	return scheme + "://" + rest
}
