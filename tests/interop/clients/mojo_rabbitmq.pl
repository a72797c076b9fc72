#!/usr/bin/perl
# Mojo::RabbitMQ::Client (Net::AMQP, opens with AMQP 0-9's header) against a broker: connect,
# declare, publish (it has no publisher confirms), consume, ack. Usage: perl mojo_rabbitmq.pl HOST PORT QUEUE;
# prints one line per step, "ok" last.
use Mojo::Base -strict;
use Mojo::IOLoop;
use Mojo::RabbitMQ::Client;

my ($host, $port, $queue) = @ARGV;
$| = 1;
my $exit = 1;
my $amqp = Mojo::RabbitMQ::Client->new(url => "amqp://guest:guest\@$host:$port/?timeout=10");
my $fail = sub { my $what = shift; sub { print "error $what\n"; Mojo::IOLoop->stop } };
Mojo::IOLoop->timer(30 => $fail->('timed out'));
$amqp->catch($fail->('connect'));
$amqp->on(open => sub {
    my ($self) = @_;
    print "connected\n";
    my $channel = Mojo::RabbitMQ::Client::Channel->new();
    $channel->catch($fail->('channel'));
    my $other = Mojo::RabbitMQ::Client::Channel->new();
    $other->catch($fail->('second channel'));
    $channel->on(open => sub {
        my ($channel) = @_;
        my $declare = $channel->declare_queue(queue => $queue, durable => 1);
        $declare->catch($fail->('declare'));
        $declare->on(success => sub {
            my (undef, $frame) = @_;
            print "declared ", $frame->method_frame->queue, "\n";
            for my $i (1 .. 3) {
                my $publish = $channel->publish(exchange => '', routing_key => $queue, body => "mojo $i",
                    header => {content_type => 'text/plain', headers => {n => $i}});
                $publish->catch($fail->('publish'));
                $publish->on(success => sub { print "published $i\n" });
                $publish->deliver;
            }
            my $got = 0;
            my $consumer = $channel->consume(queue => $queue, no_ack => 0);
            $consumer->catch($fail->('consume'));
            $consumer->on(message => sub {
                my (undef, $msg) = @_;
                $got++;
                print "got ", $msg->{body}->payload, " ", $msg->{header}->content_type, " n=",
                    $msg->{header}->headers->{n}, "\n";
                $channel->ack(delivery_tag => $msg->{deliver}->method_frame->delivery_tag)->deliver;
                if ($got == 3) {
                    # on the second channel, opened before consuming: the client waits for a
                    # reply to basic.ack on this one (against RabbitMQ too) and would take the
                    # delete-ok for it
                    my $delete = $other->delete_queue(queue => $queue);
                    $delete->catch($fail->('delete'));
                    $delete->on(success => sub { print "deleted\nok\n"; $exit = 0; Mojo::IOLoop->stop });
                    $delete->deliver;
                }
            });
            $consumer->deliver;
        });
        $declare->deliver;
    });
    $other->on(open => sub { $self->open_channel($channel) });
    $self->open_channel($other);
});
$amqp->connect();
Mojo::IOLoop->start unless Mojo::IOLoop->is_running;
exit $exit;
