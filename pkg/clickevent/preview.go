package clickevent

// PreviewFetchers are lowercase substrings of the User-Agents of link-preview
// fetchers: chat apps and social networks that GET a link as soon as it is
// posted, to draw a card. The redirect answers them without spending a
// visit-limited link's visits or showing where it leads, and the analytics
// consumer counts their clicks as bots; one list, so the two never
// disagree. Each names the fetcher, not the app: the in-app browsers of
// Snapchat, Pinterest and Viber carry the app's name, and a person tapping
// a link there must be sent on (Snap's fetcher says "Snap URL Preview
// Service").
var PreviewFetchers = []string{
	"slackbot", "slack-imgproxy", "facebookexternalhit", "facebot", "twitterbot",
	"discordbot", "whatsapp", "telegrambot", "linkedinbot", "skypeuripreview",
	"applebot", "iframely", "redditbot", "pinterestbot", "pinterest/0.", "embedly",
	"google-pagerenderer", "mastodon", "bitlybot", "vkshare",
	"bluesky", "cardyb", "outbrain", "preview",
}
